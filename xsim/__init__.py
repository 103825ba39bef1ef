"""xsim's command line: parses arguments and wires the packages' public functions together."""
