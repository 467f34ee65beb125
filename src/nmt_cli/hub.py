"""Old name of `nmt_cli.hub_models` (hub model repositories: `hf:` models, `nmt push`), kept so that
`from nmt_cli import hub` and `import nmt_cli.hub` go on working: both give that very module."""

import sys

from nmt_cli import hub_models

sys.modules[__name__] = hub_models
