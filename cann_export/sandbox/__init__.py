"""Loading and capturing an untrusted model file in a confined child process (Landlock + seccomp)."""
