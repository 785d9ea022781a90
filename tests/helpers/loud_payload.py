"""A model file whose unpickling (only with --trust-pickle: it is code) writes GitHub workflow commands and
terminal escapes straight to file descriptors 1 and 2, then yields the toy MLP, so the export goes on. In
the load sandbox's child none of it may reach the user's terminal or CI log."""
from __future__ import annotations

import os

from .toy_models import make_mlp

SHOUTED = (b"\n::error::pwned-from-the-sandbox\n", b"\n::add-mask::pwned\x1b]0;owned\x07\x1b[2J\n")


def shout():
    os.write(1, SHOUTED[0])
    os.write(2, SHOUTED[1])
    return make_mlp().eval()


class Shout:
    def __reduce__(self):
        return (shout, ())
