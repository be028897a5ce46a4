"""The training hooks' ``verify=`` options, checked at construction (PyTorch, Keras).

A leaf module: the training process imports it when a hook is built, so it imports no
analysis (capture/verification.py, which does, loads only when verification starts).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

DEFAULT_MAX_SECONDS = 600.0  # the whole verification, noise and after-run included


def verify_options(verify: Any, verify_compile: Any, max_s: Any
                   ) -> tuple[bool | list[str], bool, float]:
    """verify=, verify_compile=, verify_max_s= of the training hooks (PyTorch, Keras), checked
    once, at construction: a TypeError/ValueError names the bad one."""
    if not isinstance(verify, bool):
        if isinstance(verify, (str, bytes)) or not isinstance(verify, Iterable):
            raise TypeError(f"verify must be True, False or a list of fix ids, got {verify!r}")
        verify = list(verify)
        if not all(isinstance(v, str) and v for v in verify):
            raise TypeError(f"verify must be True, False or a list of fix ids, got {verify!r}")
    if not isinstance(verify_compile, bool):
        raise TypeError(f"verify_compile must be True or False, got {verify_compile!r}")
    if isinstance(max_s, bool) or not isinstance(max_s, (int, float)):
        raise TypeError(f"verify_max_s must be a number of seconds, got {max_s!r}")
    if not max_s > 0:
        raise ValueError(f"verify_max_s must be positive, got {max_s}")
    return verify, verify_compile, float(max_s)
