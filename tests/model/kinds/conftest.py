"""tests/model/kinds: deployment files (artifact kinds, memmap, encrypt). Fixtures: the digits
example's own fp32 and int8 graphs (see digits_graphs.py) and its data."""

from support.digits_graphs import digits_data, digits_fp32, digits_int8

__all__ = ["digits_data", "digits_fp32", "digits_int8"]
