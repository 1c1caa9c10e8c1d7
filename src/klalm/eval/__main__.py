"""`python -m klalm.eval` = `klalm-eval`."""

from klalm.cli import evaluate

if __name__ == "__main__":
    evaluate()
