"""How many tokens to draft and with what, each round: a sequence's policy (policy.py), the
server's planner that sizes every round of a batch (planner.py), and the acceptance and cost
estimates both read (estimates.py). No torch.

May import: records.py and its own modules.
"""
