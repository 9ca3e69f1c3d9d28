"""Command-line interface of perfmodel (the only layer that touches the terminal)."""
