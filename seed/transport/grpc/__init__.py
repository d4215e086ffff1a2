"""The gRPC transport (any host): one bidirectional stream per actor run, protobuf messages (seed.proto).

  channel.py      open_channel: an actor's channel (keepalive, capped redial); unix_listener_problem
  link.py         GrpcLink: the actor's side (seed/transport/link.py), one Stream call per actor run
  server.py       start_grpc_server: options, receive limit, guard and credentials put together
  guard.py        StreamGuard: the server's token check and limits against hostile or broken clients
  service.py      SlabService: the learner's side, run by the serving process (handshake check, one thread per
                  stream writing its steps into the slab)
  compression.py  lz4 for observations across a network, size-checked
"""
