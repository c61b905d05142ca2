"""Errors raised from Python look exactly like the library's: FlashTQError naming the argument and the rule."""
from flashtq._flashtq import FlashTQError


def error(argument: str, rule: str) -> FlashTQError:
    """A FlashTQError with the library's message format ("flashtq: argument 'x': rule")."""
    e = FlashTQError(f"flashtq: argument '{argument}': {rule}")
    e.argument, e.rule = argument, rule
    return e
