"""Run the synthetic benchmarks (A5, MQAR, MAD-Lab) block by block into a results folder; tables and plots.

    python scripts/run_synthetic.py run --plan full --families a5 --results results/synthetic --time-budget-s 500
    python scripts/run_synthetic.py plan --plan full --families a5 --results results/synthetic
    python scripts/run_synthetic.py report --plan full --results results/synthetic --doc docs/synthetic.md
    python scripts/run_synthetic.py --help

Same as `klalm-synthetic`; see klalm.cli.synthetic_args (its command line), klalm.tasks.runner and docs/synthetic.md.
"""

from klalm.cli import synthetic

if __name__ == "__main__":
    synthetic()
