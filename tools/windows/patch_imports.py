"""Point the extension modules (.pyd) under a folder that import one of the complex-math functions Wine's
ucrtbase lacks from DLL ``old`` at DLL ``new`` instead (same length, patched in place): how numpy and numba
reach the shim under Wine (tools/windows/setup.sh). Modules that need none of them are left alone.
Usage: patch_imports.py FOLDER OLD.dll NEW.dll NAME..."""
import re
import sys
from pathlib import Path

root, old, new = Path(sys.argv[1]), sys.argv[2].encode(), sys.argv[3].encode()
names = re.compile(rb"[\x00-\x2f](?:" + b"|".join(re.escape(n.encode()) for n in sys.argv[4:]) + rb")\x00")
assert len(old) == len(new)
n = 0
for p in sorted(root.rglob("*.pyd")):
    data = p.read_bytes()
    if data.count(old) == 1 and names.search(data):
        p.write_bytes(data.replace(old, new))
        n += 1
        print(f"  {p.relative_to(root)}")
print(f"patched {n} extension modules: {old.decode()} -> {new.decode()}")
