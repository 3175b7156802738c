"""What a run can do: one module per capability (children, threads, streams, fork, flow control, results, search, schedules, ...), as SQL calls on a :class:`pgdurable.foundation.ports.App`."""
