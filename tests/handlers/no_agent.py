"""Not a Handler script: its __main__ block never starts an Agent."""

if __name__ == "__main__":
    print("nothing to serve")
