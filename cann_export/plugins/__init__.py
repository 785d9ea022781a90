"""Default plugins, registered through the same plugin manager as third-party ones."""
