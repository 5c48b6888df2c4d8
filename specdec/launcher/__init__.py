"""`python -m specdec.launcher.launch` (`make serve`): tritonserver and the OpenAI gateway
started, kept alive and stopped (launch.py, keeper.py, procs.py, shutdown.py). A model's health
and restarts inside the server are serving's (serving/probe.py, serving/recovery.py).

May import: serving/ and the packages below it.
"""
