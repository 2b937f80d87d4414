"""Named barriers: every party waits until all have arrived.

``barrier`` (``Barrier``), ``wait`` (one arrival, to its release), ``index``
(the job's barrier index, ``BarrierInfo``) and ``finish`` (ending a job once
its end barrier completed).
"""
