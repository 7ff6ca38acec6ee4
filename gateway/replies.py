"""The gateway's reply channel is ``broker.replies.ReplyRouter``, which workers
hosting ensembles use too; the gateway's modules import it from here."""

from broker.replies import ReplyRouter

__all__ = ["ReplyRouter"]
