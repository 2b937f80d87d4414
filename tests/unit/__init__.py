"""Unit tests: no server, no process, no network (fakeredis at most); seconds in all.

`make test-unit` runs them alone; `make test` runs them with the rest.
"""
