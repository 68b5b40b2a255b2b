"""``python -m beam_pipeline convert --input ./photos --output ./out``"""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
