"""What commands say to the user and accept from them, shared by the CLI and the plugins that add commands:
examples in --help (examples.py), the articles' spellings (spellings.py)."""
