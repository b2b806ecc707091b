"""The one error type the course tools raise for bad input or a bad environment.

The command line turns a ``CourseError`` into a single line on stderr and exit
status 2, never a traceback.
"""

from __future__ import annotations


class CourseError(Exception):
    """A problem the user can fix; the message says what is wrong and what to do."""
