"""Errors every wing shares. ``ConfigError``: a value a user gave is wrong; ``str()`` is one line
that names the key, and the command line turns it into exit status 2."""


class ConfigError(ValueError):
    """A configuration or SLO value is wrong. ``str()`` is one line naming the key."""
