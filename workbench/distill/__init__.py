"""QTSA distillation: corpus sections to Question-Thinking-Solution-Answer data and an MC benchmark."""
