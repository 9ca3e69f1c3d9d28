"""``python -m perfmodel.cli`` and the ``perfmodel`` command: one command, in a short-lived process."""

import gc


def run() -> None:
    """Load the command line and run the command. The cyclic garbage collector is paused while the
    command line's modules load (typer and the commands' options build tens of thousands of objects
    that live as long as the process, and collections that walk them again and again cost 0.03 s of
    the Megatron 1T ``plan train``'s 0.59 s, measured side by side); what the loading built is then
    frozen, out of every later collection, and the command runs with the collector on."""
    gc.disable()
    from .app import run as run_app

    gc.freeze()
    gc.enable()
    run_app()


if __name__ == "__main__":
    run()
