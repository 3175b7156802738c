"""Operations: the command line, the worker process, the dashboard, webhooks, retention, partitions, the demo and the pytest plugin."""
