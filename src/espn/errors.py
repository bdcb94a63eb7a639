"""The base class of the errors a user can fix.

Every error espn raises for bad input (an option, a file, a checkpoint, a run directory, a
dataset that is not there, a run that cannot go on without breaking a guarantee) derives from
:class:`EspnError`; its message is one line saying what was wrong and what is accepted. The
CLI turns any of them into ``error: <message>`` and exit status 2 (:mod:`espn.utils.commands`);
library users can catch them all with ``except espn.errors.EspnError``. The specific classes
also keep their standard base (``ValueError`` or ``RuntimeError``).
"""

from __future__ import annotations


class EspnError(Exception):
    """An error the user can fix; the message says what was wrong and what is accepted."""
