"""``python -m vllm_admission.cli``: the ``vllm-admission`` command."""

import sys

from vllm_admission.cli import main

sys.exit(main())
