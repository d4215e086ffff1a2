"""The shared-memory transport (the learner's host only): an actor writes its steps into the step slab itself.

  protocol.py  the handover socket (`<unix socket>.shm`) and its frames
  handover.py  ShmHandover: the learner's side, run by the serving process: authenticates an actor and hands it
               the slab's descriptors
  link.py      ShmLink: the actor's side (seed/transport/link.py): handshake over the handover socket, then
               steps through the slab
"""
