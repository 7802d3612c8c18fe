"""The fast path: static-cache decoding steps, packed and compiled steps, ragged batch rows, the twig's split trunk, timed forwards."""
