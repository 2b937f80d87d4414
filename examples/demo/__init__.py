"""``make demo``: a real local TensorFlow parameter-server job held back by the barrier.

Run from the checkout's top folder, ``python -m examples.demo --help``. Its
modules: ``__main__`` (the command line), ``run`` (the job and its live view),
``local`` (an embedded Redis and the child processes) and ``views`` (what it
shows). It runs ``examples/tf1_parameter_server.py`` in each of its processes
and borrows the package's private helpers (its settings checks, the status
view's waiter table): it lives in the checkout beside the package it shows.
"""
