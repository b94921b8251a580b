"""A prompt's ids on their way in: the vocabulary check and the conversion to the list of
Python ints the engine keeps (``TokenIds``), in as few passes over the ids as possible.

A chat turn's prompt holds the whole conversation (~1,500 ids), and an async client's
next turn is taken in while its cohort's step waits: checking the ids with ``min`` and
``max`` and converting them with ``map(int, ...)`` cost ~74 us a request on the event
loop. Where numpy sees integers only (``integer_array``), one conversion to an int64 array
gives both scans in C and ``tolist`` gives the ints (~40 us). Anything numpy does not hold
as integers (floats, strings, ints past 64 bits, lists of bools only) takes the general
path, so what is accepted, refused and named in an error does not depend on which path
ran.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def integer_array(ids: Sequence[Any]) -> np.ndarray | None:
    """``ids`` as a one-dimensional integer array when every id is an integer numpy can
    hold (it infers an integer dtype), else None: then ``int()`` of each id is the id
    itself, so checking the array is checking the ids."""
    try:
        arr = np.asarray(ids)
    except (ValueError, TypeError, OverflowError):  # ragged or odd input: the general path
        return None
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        return None
    return arr


def first_out_of_vocab(ids: Sequence[Any], vocab_size: int) -> Any:
    """The first id outside [0, vocab_size), or None. Min and max scan the ids in C, and
    only ids that fail them are walked in Python (the walk names the first bad id in
    prompt order; checking each id was ~60 us of a cached turn's ~150 us intake)."""
    if isinstance(ids, np.ndarray) and ids.dtype.kind in "iu":
        if ids.size == 0 or (ids.min() >= 0 and ids.max() < vocab_size):
            return None
        return int(ids[(ids < 0) | (ids >= vocab_size)][0])
    try:
        if 0 <= min(ids) and max(ids) < vocab_size:
            return None
    except TypeError:  # ids of mixed kinds: the walk below says which one is wrong
        pass
    return next((t for t in ids if not 0 <= int(t) < vocab_size), None)
