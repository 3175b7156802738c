"""The programming models: each turns user code into step functions the engine runs (``@app.task``, durable tasks, ``@app.workflow``)."""
