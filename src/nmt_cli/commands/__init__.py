"""One thin module per subcommand: parse options, call one core function, render the result."""
