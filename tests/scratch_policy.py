"""A test eviction policy written as source text: ``scratch_mru``, most recently freed
first. ``tests/test_new_policy.py`` appends it to a scratch copy of the package's registry;
``tests/test_policy_plugins.py`` puts it in a scratch package declared by an entry point.
The text expects ``EvictionPolicy`` in scope."""

SCRATCH_MRU_SOURCE = '''class ScratchMRUEviction(EvictionPolicy):
    """Most recently freed first (a test policy)."""

    name = "scratch_mru"
    summary = "most recently freed first"

    def __init__(self):
        self._order = {}

    def add(self, block_id, now, value=0.0, next_use=float("inf")):
        if block_id in self._order:
            raise KeyError(f"block {block_id} is already a candidate")
        self._order[block_id] = None

    def remove(self, block_id):
        del self._order[block_id]

    def pop(self, now):
        if not self._order:
            raise IndexError("pop from an empty eviction queue")
        return self._order.popitem()[0]

    def clone(self):
        other = ScratchMRUEviction()
        other._order = dict(self._order)
        return other

    def __len__(self):
        return len(self._order)

    def __contains__(self, block_id):
        return block_id in self._order
'''
