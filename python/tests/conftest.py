import signal

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(7)


@pytest.fixture
def ctrl_c():
    """Ctrl-C raising ``KeyboardInterrupt``, as at an interactive prompt: Python installs that
    handler only when its parent did not ignore SIGINT, and a shell ignores it in the commands
    it starts in the background (a CI job's, say), where ``_thread.interrupt_main`` then does
    nothing. Restored afterwards."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)
