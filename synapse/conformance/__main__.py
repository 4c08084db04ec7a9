"""`python -m synapse.conformance …`: the same as `synapse conformance …`."""

import sys

from synapse.conformance.cli import main

sys.exit(main())
