"""`python -m klalm.train` = `klalm-train`."""

from klalm.cli import train

if __name__ == "__main__":
    train()
