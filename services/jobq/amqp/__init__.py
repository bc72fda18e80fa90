"""The broker's side: connecting (cluster failover, TLS), the exchange and queues
(topology), publishing with confirms, and deliveries as the consumer settles them."""
