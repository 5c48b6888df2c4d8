"""Test and benchmark hooks, attached from outside the serving path: a simulated device
(simulate.py, engine calls padded to another device's measured times) and injected faults
(faults.py). Nothing on the serving path imports them; the settings that ask for them do.
"""
