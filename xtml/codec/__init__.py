"""The codec: a dialect and a vocabulary binding put to work, with no I/O.

Parse in one go (:mod:`.parse`) and token by token
(:mod:`.stream`), conversations that render only their new turns
(:mod:`.conversation`), training masks (:mod:`.training`), and the plan of
what a completion may hold, for constrained decoding (:mod:`.completion`).
The facade (:mod:`xtml.template`) stands on this package; nothing here
imports the facade or anything above it.
"""
