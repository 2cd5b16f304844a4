"""One thin driver per `retromae` command: parse the options, resolve the inputs once, call the library, print."""
