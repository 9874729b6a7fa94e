"""`python -m idattn.export` (idattn.export.cli)."""
from idattn.export.cli import define_flags, main

if __name__ == "__main__":
    from idattn.configs.flags import run_app  # a --config.<key> typo: one readable line

    define_flags()
    run_app(main)
