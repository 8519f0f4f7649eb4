"""Kafka broker conformance suite: is this Kafka cluster fit for the Lambda platform?"""
