"""``python -m beam_pipeline convert --input ./photos --output ./out``"""

from .cli import console_main

if __name__ == "__main__":
    console_main()
