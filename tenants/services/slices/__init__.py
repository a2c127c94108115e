"""The slice lifecycle: launch, queue, provision, run, stop, reconcile.

States form a small explicit machine (`state.ALLOWED`); every change goes through
`state.slice_transition`, which records it. The VRAM is reserved in `nodes` as an
allocation owned by the slice's opaque key; any failure releases it. Tasks may run twice:
each step checks the state under the slice's row lock before it acts, and SSH work
happens outside transactions.
"""
