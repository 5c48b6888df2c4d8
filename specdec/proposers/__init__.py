"""Who proposes a round's tokens. base.py is the loop's interface to them (Drafter, and the
proposer sets a request may ask for); prompt lookup (ngram.py) and suffix decoding (suffix.py)
run in the loop's process; the drafters in the target's process implement the engine's
in_target interface: an EAGLE-3 head (eagle/), Medusa heads (medusa/), SWIFT's skipped layers
(swift.py) and a co-located draft model (colocated.py).

May import: records.py, planning/ (base.py reads the policy's choice), and the engine.
"""
