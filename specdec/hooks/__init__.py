"""Test and benchmark hooks, outside the serving path: a simulated device (simulate.py, engine
calls padded to another device's measured times) and injected faults (faults.py). Serving
imports them only inside the code their settings turn on ($SPECDEC_SIMULATE, the fault
scripts), never when its modules load (tests/test_import_graph.py).

May import: serving/ and the packages below it.
"""
