import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
# tnt-comm's rank spawner (ranks.py) serves these tests too, for jobs that need no launcher.
sys.path.insert(0, str(HERE.parents[1] / "tnt-comm" / "tests"))
