"""The bounds every file perfmodel reads is held to (``files`` checks sizes, ``yaml_loader`` the trees)."""

MIB = 1 << 20
MAX_YAML_BYTES = 4 * MIB       # the largest built-in file is under 40 KB
MAX_JSON_BYTES = 4 * MIB       # a Hugging Face config.json is a few KB
MAX_DEPTH = 32                 # the deepest built-in or Hugging Face structure is under 8 levels
MAX_NODES = 1_000_000          # values in one document, aliases counted as often as they are used
MAX_INT_DIGITS = 30
