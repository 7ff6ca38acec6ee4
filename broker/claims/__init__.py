"""Claim-check tensors: large tensor bytes travel beside the broker message, not in it.

Above a size threshold a tensor's bytes go into a ``ClaimStore`` (``store``)
and the envelope carries only a short claim naming them (``check``). The
receiver redeems the claim; whoever is last to need the bytes deletes them,
and a TTL removes what a crashed process leaves behind.
"""
