"""ferry's broker layer: the wire envelope and the transports behind one seam."""
