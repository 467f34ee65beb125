"""Python 3.11 refuses unhashable (dataclass instance) defaults in dataclasses: rewrite
`x: T = T()` and `x: T = field(default=T())` into `field(default_factory=T)`, adding the `field` import."""
import re
import sys
from pathlib import Path

PAT = re.compile(r"^(\s+\w+: *(\w+) *= *)(?:\2\(\)|field\(default=\2\(\)\))[ \t]*$", re.M)
for path in map(Path, sys.argv[1:]):
    text = path.read_text()
    new, n = PAT.subn(lambda m: f"{m.group(1)}field(default_factory={m.group(2)})", text)
    if n:
        if not re.search(r"^from dataclasses import .*\bfield\b", new, re.M):
            new = re.sub(r"^(from dataclasses import )", r"\1field, ", new, count=1, flags=re.M) \
                if re.search(r"^from dataclasses import ", new, re.M) else "from dataclasses import field\n" + new
        path.write_text(new)
        print(path, n)
