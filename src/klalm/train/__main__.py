"""`python -m klalm.train` = `klalm-train`."""

from klalm.train.app import main

if __name__ == "__main__":
    main()
