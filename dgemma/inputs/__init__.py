"""What a run is given: knobs, prompt tokens, a conversation, encoded context, images, pins, its seed."""
