"""Old name of `nmt_cli.data.hub_corpora` (a corpus's pinned files from hub dataset repositories), kept so that
`from nmt_cli.data import hub` and `import nmt_cli.data.hub` go on working: both give that very module."""

import sys

from nmt_cli.data import hub_corpora

sys.modules[__name__] = hub_corpora
