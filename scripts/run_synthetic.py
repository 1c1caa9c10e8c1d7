"""Train kla / gpt / mamba / gdn on the synthetic benchmarks (A5, MQAR, MAD-Lab); write tables and plots.

    python scripts/run_synthetic.py --budget quick --out runs/synthetic_quick
    python scripts/run_synthetic.py --help

See klalm.tasks.runner and docs/synthetic.md.
"""

from klalm.tasks.runner import main

if __name__ == "__main__":
    main()
