"""The one exception type that the CLI turns into a clean exit 2."""


class UsageError(ValueError):
    """Bad input from the user: the message is one line that names the problem
    and the accepted forms. The CLI prints it to stderr and exits with status 2,
    without a traceback."""
