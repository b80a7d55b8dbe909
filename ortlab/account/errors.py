"""The one error of the memory account."""

from ortlab.errors import InputError


class AccountError(InputError):
    """No execution graph where it was looked for, a damaged one, or a dimension the account needs and lacks
    (the message names it and what is allowed)."""
