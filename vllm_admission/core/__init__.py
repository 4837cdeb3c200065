"""Pure-Python core shared by the simulator and the vLLM plugin.

Nothing in this package may import ``vllm`` or ``torch``
(``tests/test_core_purity.py`` enforces it).
"""
